"""The generated gRPC stubs of proto/flce/v1/flce.proto, committed in flce/v1/.

They are imported as they are: importing flce never runs protoc, so a read-only or
installed copy works and DDP ranks do not race to write files. scripts/gen_python_stubs.sh
regenerates them after a proto change (tests/python/test_packaging.py checks they match)."""
from flce.v1 import flce_pb2 as pb
from flce.v1 import flce_pb2_grpc as pb_grpc

__all__ = ["pb", "pb_grpc"]
