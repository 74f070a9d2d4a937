"""SGLang's native routes besides /generate, each module with its request bodies; the harvest feed."""
