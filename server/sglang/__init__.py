"""`gleanrl serve --backend sglang`: stock SGLang's flags and process."""
