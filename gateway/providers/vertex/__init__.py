"""`kind = "vertex"`: Vertex AI's Gemini, with service-account or application default
credentials (vertex.py; the generateContent side is gemini's)."""

from model_gateway.gateway.providers.vertex.vertex import VertexProvider as PROVIDER

__all__ = ["PROVIDER"]
