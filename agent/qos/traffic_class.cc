#include "agent/qos/traffic_class.h"

namespace ferry {

const char* ClassName(TrafficClass c) {
  switch (c) {
    case TrafficClass::kLatency:
      return "latency";
    case TrafficClass::kBulk:
      return "bulk";
    case TrafficClass::kBackground:
      return "background";
  }
  return "?";
}

bool ParseClassName(absl::string_view name, TrafficClass* out) {
  for (TrafficClass c : {TrafficClass::kLatency, TrafficClass::kBulk, TrafficClass::kBackground}) {
    if (name == ClassName(c)) {
      *out = c;
      return true;
    }
  }
  return false;
}

bool FromProto(v1::TrafficClass proto, TrafficClass* out) {
  switch (proto) {
    case v1::TRAFFIC_CLASS_LATENCY:
      *out = TrafficClass::kLatency;
      return true;
    case v1::TRAFFIC_CLASS_BULK:
      *out = TrafficClass::kBulk;
      return true;
    case v1::TRAFFIC_CLASS_BACKGROUND:
      *out = TrafficClass::kBackground;
      return true;
    default:
      return false;
  }
}

v1::TrafficClass ToProto(TrafficClass c) {
  switch (c) {
    case TrafficClass::kLatency:
      return v1::TRAFFIC_CLASS_LATENCY;
    case TrafficClass::kBulk:
      return v1::TRAFFIC_CLASS_BULK;
    case TrafficClass::kBackground:
      return v1::TRAFFIC_CLASS_BACKGROUND;
  }
  return v1::TRAFFIC_CLASS_UNSPECIFIED;
}

}  // namespace ferry
