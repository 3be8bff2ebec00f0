"""The model runtimes: builds, parity with transformers, weight loading, the fast kernels."""
