"""Checkpoints and weight updates: loading and checking, the swap records, tensor and
process-group payloads."""
