"""SGLang's native `/generate` (`route.py`) and what the OpenAI routes share with it: request fields
to engine requests (`params.py`), the run that merges their streams (`fanin.py`), text, logprobs,
structured output and reasoning at the edge, and the answer whole or streamed (`answer.py`)."""
