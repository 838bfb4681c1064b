"""The generated message modules of every Assay proto, by short name."""

from ._proto.assay.arbiter.v1 import arbiter_pb2 as arbiter
from ._proto.assay.common.v1 import common_pb2 as common
from ._proto.assay.debate.v1 import debate_pb2 as debate
from ._proto.assay.delta_judge.v1 import delta_judge_pb2 as delta_judge
from ._proto.assay.gateway.v1 import gateway_pb2 as gateway
from ._proto.assay.generator.v1 import generator_pb2 as generator
from ._proto.assay.refiners.v1 import refiners_pb2 as refiners
from ._proto.assay.scorer.v1 import scorer_pb2 as scorer

__all__ = ["arbiter", "common", "debate", "delta_judge", "gateway", "generator", "refiners", "scorer"]
