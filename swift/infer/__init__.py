"""Inference engines behind one protocol: `InferEngine.infer(requests, config)`."""
from swift.infer.protocol import (Choice, InferEngine, InferRequest, InferResponse, RequestConfig, StreamDelta,
                                  TokenLogprob)
from swift.infer.transformers_engine import TransformersEngine

__all__ = ["Choice", "InferEngine", "InferRequest", "InferResponse", "RequestConfig", "StreamDelta", "TokenLogprob",
           "TransformersEngine"]
