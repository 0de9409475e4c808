"""Generated gRPC stubs of proto/flce/v1/flce.proto (see flce._codegen); not committed."""
