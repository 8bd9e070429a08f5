// FillTopology: the GetTopology answer, from the discovered topology and, where the
// fabric is on, its NICs, their pinning and the rails.
#ifndef FERRY_AGENT_MAIN_TOPOLOGY_REPORT_H_
#define FERRY_AGENT_MAIN_TOPOLOGY_REPORT_H_

#include "agent/engine/fabric_engine.h"
#include "agent/topology/topology.h"
#include "proto/ferry/v1/ferry.pb.h"

namespace ferry {

// `engine` may be null (no --peer_address): then the node's NICs are listed, no rails.
void FillTopology(const Topology& topology, const FabricEngine* engine, v1::GetTopologyResponse* resp);

}  // namespace ferry

#endif  // FERRY_AGENT_MAIN_TOPOLOGY_REPORT_H_
