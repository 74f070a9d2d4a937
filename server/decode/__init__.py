"""The decode step: one iteration over the running sequences, plain or SD (`sd_decoder.py`)."""
