"""Money on the request path: the meters (storage and leased), prices, amounts, and the
402s that explain themselves."""
