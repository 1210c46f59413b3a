"""Generated protobuf and gRPC code of the OIP gRPC protocol (`inference.proto`; `make proto`)."""
