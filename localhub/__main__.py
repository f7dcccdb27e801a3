"""``python -m localhub --root DIR --port 0``: serve a local stand-in for the Hugging Face Hub."""

from __future__ import annotations

from localhub.server import serve

if __name__ == "__main__":
    serve()
