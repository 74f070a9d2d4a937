"""SGLang's native routes besides /generate: control (`control.py`: disk weight updates, health,
flush, pause, abort, metrics), discovery, tokenize, reasoning separation, in-memory and process-group
weight sync, and gleanrl's harvest feed. Each module holds its routes' request bodies."""
