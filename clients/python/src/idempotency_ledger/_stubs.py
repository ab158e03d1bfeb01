"""The generated gRPC stubs of ``proto/idempotency/v1/ledger.proto``: the one place that names
where they are installed."""

from idempotency.v1 import ledger_pb2, ledger_pb2_grpc

__all__ = ["ledger_pb2", "ledger_pb2_grpc"]
