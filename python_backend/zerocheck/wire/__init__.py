"""The tensor tables between models (the step wire, the sampling columns): names, dtypes and dims that both
ends and the configs follow. Imports neither torch nor Triton."""
