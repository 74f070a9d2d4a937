"""The HTTP edge, one sub-package per route family, in layers: `edge/` (what every request passes),
`generate/` (/generate and the generation core), `openai/`, `native/` (SGLang's other routes, the
harvest feed); `app.py` mounts them."""
