"""Loaders and validators of weights: target checkpoints, drafters, named tensors and their payloads
and process groups. They return runners, drafters or checked tensors; the engine installs them."""
