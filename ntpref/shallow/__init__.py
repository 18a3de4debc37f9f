"""Paper (2): a shallow multi-head transformer trained by projected GD, its NTK, and the IndRNN baseline
(docs/shallow.md)."""
