"""`kind = "azure"`: Azure OpenAI deployments (azure.py)."""

from model_gateway.gateway.providers.azure.azure import AzureProvider as PROVIDER

__all__ = ["PROVIDER"]
