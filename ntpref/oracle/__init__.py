"""The oracle's public face: interchange files, the eval/train contract, comparison, reference runs."""
