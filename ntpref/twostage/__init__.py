"""Paper (1): two-stage normalized gradient descent for next-token prediction (docs/twostage.md)."""
