"""quantize-serve: quantize a base model, serve it with vLLM, gate it, release it (README.md)."""

from quantize_serve.core import ast_lock

ast_lock.install()  # before any thread of the pipeline parses (core/ast_lock.py says why)
