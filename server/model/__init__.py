"""The target model's forward: the runner, attention kernels, the KV caches and slot pool."""
