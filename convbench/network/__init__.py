"""The CosmoFlow networks with DaCe convolutions: models, data, the network check, end to end."""
