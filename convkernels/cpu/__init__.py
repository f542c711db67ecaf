"""CPU kernels sized by the host's vector ISA: register-blocked direct convolutions, Winograd."""
