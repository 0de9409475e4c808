"""The generated stubs, generated first when they are missing or stale."""
from flce import _codegen

_codegen.ensure()

from flce.v1 import flce_pb2 as pb  # noqa: E402
from flce.v1 import flce_pb2_grpc as pb_grpc  # noqa: E402

__all__ = ["pb", "pb_grpc"]
