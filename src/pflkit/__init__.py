"""pflkit: personalized and collaborative federated learning, batched over clients."""

__version__ = "0.1.0"
