"""The simulated market: models, endpoints, providers, and OpenRouter's routing over them."""
