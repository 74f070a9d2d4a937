"""SGLang's native `/generate` (`route.py`) and the generation core the OpenAI routes share with it."""
