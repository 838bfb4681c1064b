"""External client: plain grpcio with server reflection, no generated Assay stubs.

Usage: external_client.py HOST:PORT
Lists services by reflection, checks health, builds an EvaluateRequest from the reflected
descriptors and calls GatewayService.Evaluate. Exits non-zero on any mismatch.
"""

import sys

import grpc
from google.protobuf import descriptor_pool, json_format
from google.protobuf.message_factory import GetMessageClass
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

GATEWAY = "assay.gateway.v1.GatewayService"


def main(addr: str) -> int:
    channel = grpc.insecure_channel(addr)
    grpc.channel_ready_future(channel).result(timeout=10)

    db = ProtoReflectionDescriptorDatabase(channel)
    services = set(db.get_services())
    assert GATEWAY in services, services
    print("services:", ", ".join(sorted(services)))

    health = health_pb2_grpc.HealthStub(channel)
    for name in ("", GATEWAY):
        status = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=5).status
        assert status == health_pb2.HealthCheckResponse.SERVING, (name, status)
    print("health ok")

    pool = descriptor_pool.DescriptorPool(db)
    service = pool.FindServiceByName(GATEWAY)
    method = service.methods_by_name["Evaluate"]
    request_cls = GetMessageClass(method.input_type)
    response_cls = GetMessageClass(method.output_type)
    request = json_format.ParseDict(
        {
            "pipeline": {
                "source": {
                    "checklist": {
                        "id": "py",
                        "items": [
                            {"id": "a", "question": "Is it three lines?"},
                            {"id": "b", "question": "Is it about autumn?"},
                        ],
                    }
                },
                "records": [{"id": "r1", "input": "Write a haiku.", "target": "red leaves fall"}],
            }
        },
        request_cls(),
    )
    call = channel.unary_unary(
        f"/{GATEWAY}/Evaluate",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=response_cls.FromString,
    )
    reply = call(request, timeout=30)
    out = json_format.MessageToDict(reply)
    score = out["results"][0]["score"]
    assert score["passRate"] == 1.0, out
    assert out["usage"]["calls"] == 1, out
    print("evaluate ok:", score["passRate"], out["aggregate"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
