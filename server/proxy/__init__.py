"""`gleanrl proxy`: a relay before stock SGLang that records the harvest feed."""
