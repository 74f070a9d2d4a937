"""The HTTP edge: SGLang's native routes, the OpenAI routes, auth, limits, schemas, the harvest
feed."""
