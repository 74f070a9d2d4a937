"""What every decode path uses, below `sd/` and `decode/`: the `Sequence`, sampling, penalties, stops, grammar masks,
and the prompt's own logprobs."""
