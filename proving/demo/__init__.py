"""`idempotent-workers demo`: crashes and duplicates in, exactly-once effects out."""

from proving.demo.run import run_demo

__all__ = ["run_demo"]
