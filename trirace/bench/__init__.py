"""Side-by-side benchmarks: every system on the same model, data, seed and processes."""
