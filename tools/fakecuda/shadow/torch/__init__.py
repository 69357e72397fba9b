"""Shadows torch under tools/fakecuda: torch's CUDA runtime would call the stand-in driver for entry points it does
not implement. Code that treats torch as optional sees it missing; a test that needs it skips."""
raise ModuleNotFoundError("torch is shadowed under tools/fakecuda (it needs the real driver)")
