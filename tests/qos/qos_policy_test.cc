// The --qos_* flags: rules parsed and matched, classes resolved against ceilings, and
// every bad configuration refused with the flag and field to fix.
#include "agent/qos/qos_policy.h"

#include <catch2/catch.hpp>
#include <string>

namespace ferry {
namespace {

QosFlags Flags(std::string tenants, std::string fallback = "") {
  QosFlags f;
  f.tenants = std::move(tenants);
  f.default_tenant = std::move(fallback);
  f.max_op_bytes = 4 << 20;
  return f;
}

TEST_CASE("rules parse, and the first that matches a pod's uid or gid wins") {
  absl::StatusOr<QosPolicy> p = ParseQosPolicy(
      Flags("uid=1000, ceiling=latency, class=latency, weight=4, inflight=64MiB, rate=2GB; gid=2000,ceiling=bulk",
            "ceiling=background"));
  REQUIRE(p.ok());
  REQUIRE(p->rules.size() == 2);
  const TenantRule& kv = p->Match(1000, 2000);
  CHECK(kv.name == "uid=1000");
  CHECK(kv.default_class == TrafficClass::kLatency);
  CHECK(kv.weight == 4);
  CHECK(kv.inflight_cap == 64ull << 20);
  CHECK(kv.rate_cap == 2000000000ull);
  const TenantRule& bulk = p->Match(1001, 2000);
  CHECK(bulk.name == "gid=2000");
  CHECK(bulk.ceiling == TrafficClass::kBulk);
  CHECK(bulk.default_class == TrafficClass::kBulk);
  const TenantRule& other = p->Match(1001, 2001);
  CHECK(other.name == "default");
  // No class given: the ceiling's, when the usual default (bulk) is above it.
  CHECK(other.default_class == TrafficClass::kBackground);
}

TEST_CASE("the defaults: every pod may ask for latency, gets bulk, weights 8:4:1") {
  absl::StatusOr<QosPolicy> p = ParseQosPolicy(Flags(""));
  REQUIRE(p.ok());
  CHECK(p->scheduling.enabled);
  CHECK(p->fallback.ceiling == TrafficClass::kLatency);
  CHECK(p->fallback.default_class == TrafficClass::kBulk);
  CHECK(p->scheduling.class_weights[0] == 8);
  CHECK(p->scheduling.class_weights[2] == 1);
  // ferryd's --qos_class_weights default is the same weights, written out.
  CHECK(FormatClassWeights(p->scheduling) == "latency=8,bulk=4,background=1");
  QosFlags written = Flags("");
  written.class_weights = "background=2,latency=9";
  absl::StatusOr<QosPolicy> q = ParseQosPolicy(written);
  REQUIRE(q.ok());
  CHECK(FormatClassWeights(q->scheduling) == "latency=9,bulk=4,background=2");
}

TEST_CASE("a class is resolved against the pod's ceiling") {
  TenantRule rule;
  rule.name = "gid=2000";
  rule.ceiling = TrafficClass::kBulk;
  rule.default_class = TrafficClass::kBulk;
  CHECK(*ResolveClass(rule, v1::TRAFFIC_CLASS_UNSPECIFIED) == TrafficClass::kBulk);
  CHECK(*ResolveClass(rule, v1::TRAFFIC_CLASS_BACKGROUND) == TrafficClass::kBackground);
  absl::StatusOr<TrafficClass> above = ResolveClass(rule, v1::TRAFFIC_CLASS_LATENCY);
  REQUIRE(above.status().code() == absl::StatusCode::kPermissionDenied);
  CHECK_THAT(std::string(above.status().message()),
             Catch::Contains("latency is above this pod's ceiling bulk") && Catch::Contains("gid=2000"));
  CHECK(ResolveClass(rule, static_cast<v1::TrafficClass>(9)).status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("byte counts take binary and decimal suffixes") {
  uint64_t n = 0;
  CHECK((ParseBytes("4096", &n) && n == 4096));
  CHECK((ParseBytes("64KiB", &n) && n == 65536));
  CHECK((ParseBytes("3GB", &n) && n == 3000000000ull));
  CHECK_FALSE(ParseBytes("", &n));
  CHECK_FALSE(ParseBytes("1.5MiB", &n));
  CHECK_FALSE(ParseBytes("-1", &n));
  CHECK_FALSE(ParseBytes("99999999999GiB", &n));
}

TEST_CASE("bad configurations are refused, naming the flag and what to fix") {
  struct Row {
    QosFlags flags;
    const char* says;
  };
  QosFlags weights = Flags("");
  weights.class_weights = "latency=8,urgent=2";
  QosFlags weight0 = Flags("");
  weight0.class_weights = "bulk=0";
  QosFlags window = Flags("");
  window.latency_window_bytes = 32 << 20;
  QosFlags window0 = Flags("");
  window0.window_bytes = 0;
  const Row rows[] = {
      {Flags("uid=1000,class=urgent"), "--qos_tenants: rule 1: unknown class 'urgent' for class"},
      {Flags("uid=1000,ceiling=fast"), "unknown class 'fast' for ceiling"},
      {Flags("uid=1000,weight=0"), "rule 1: weight must be 1..1000, not '0'"},
      {Flags("uid=1000,weight=1001"), "weight must be 1..1000"},
      {Flags("uid=1000,inflight=1MiB"), "inflight=1MiB is smaller than one op (--fabric_max_op_bytes=4194304)"},
      {Flags("uid=1000,inflight=lots"), "inflight must be a byte count"},
      {Flags("uid=1000,rate=0"), "rate must be bytes per second"},
      {Flags("uid=1000,ceiling=bulk,class=latency"), "class=latency is above ceiling=bulk"},
      {Flags("ceiling=bulk"), "rule 1: a rule needs uid=N or gid=N"},
      {Flags("uid=1000,gid=5"), "by one uid or one gid, not both"},
      {Flags("uid=abc"), "uid must be a number, not 'abc'"},
      {Flags("uid=1000,prio=9"), "unknown field 'prio=9'"},
      {Flags("uid=1000;uid=1000,weight=2"), "rule 2: uid=1000 already has a rule"},
      {Flags("", "uid=7"), "--qos_default_tenant: the default rule: 'uid' has no place here"},
      {Flags("", "weight=0"), "--qos_default_tenant: the default rule: weight must be 1..1000"},
      {weights, "--qos_class_weights: unknown class 'urgent'"},
      {weight0, "--qos_class_weights: bulk must be 1..1000, not '0'"},
      {window, "--qos_latency_window_bytes must be 1..--qos_window_bytes"},
      {window0, "--qos_window_bytes must be >= 1"},
  };
  for (const Row& row : rows) {
    absl::StatusOr<QosPolicy> p = ParseQosPolicy(row.flags);
    INFO(row.flags.tenants << " | " << row.flags.default_tenant << " | " << row.flags.class_weights);
    REQUIRE(p.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(p.status().message()), Catch::Contains(row.says));
  }
}

}  // namespace
}  // namespace ferry
