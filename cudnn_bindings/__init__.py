"""ctypes bindings to cuDNN for 3D convolution (forward, backward data, backward filter).

Not implemented yet: a later issue fills this package.  Nothing imports it.
"""
