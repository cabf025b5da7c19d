"""What makes the engine fast and exact on a CPU.

- `step.py`: the decoding step compiled from `native/step.cpp` (built once per machine)
- `products.py`: the matrix products (GGUF's 4-bit blocks, prepacked dense weights) and the rows a
  product needs so that a single step and a verify pass round alike
- `governor.py`: fewer threads while other programs keep the cores busy, never a changed bit
"""
