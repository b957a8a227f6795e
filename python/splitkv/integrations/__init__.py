"""Adapters that let other serving stacks call splitkv.

Each submodule imports its host library and is optional: ``import splitkv`` never imports
them, so the core package needs torch only. :mod:`splitkv.integrations.transformers`:
Hugging Face transformers' continuous batching (``pip install splitkv[transformers]``).
"""
