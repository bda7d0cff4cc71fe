"""The words gpupool's records and messages are told in: no imports from the rest of gpupool."""
