"""Shadows CuPy under tools/fakecuda: CuPy's CUDA runtime would call the stand-in driver for entry points it does
not implement. Code that treats CuPy as optional sees it missing; a test that needs it skips."""
raise ModuleNotFoundError("cupy is shadowed under tools/fakecuda (it needs the real driver)")
