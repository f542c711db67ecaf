"""The tensor-core main loop (mma.sync; float16, bfloat16, TF32): tiles, layouts, passes, PTX."""
