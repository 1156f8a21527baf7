"""Model building blocks: attention, linear (incl. quantized), rotary, norm, sampler."""
