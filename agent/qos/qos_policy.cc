#include "agent/qos/qos_policy.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace ferry {
namespace {

constexpr uint32_t kMaxWeight = 1000;

bool ParseWeight(absl::string_view v, uint32_t* out) {
  return absl::SimpleAtoi(v, out) && *out >= 1 && *out <= kMaxWeight;
}

// One rule's fields. `flag` and `where` name it in errors; uid/gid only if `matches`.
absl::StatusOr<TenantRule> ParseRule(absl::string_view text, bool matches, uint64_t max_op_bytes,
                                     absl::string_view flag, absl::string_view where) {
  TenantRule rule;
  bool class_set = false;
  auto error = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": ", where, ": ", what));
  };
  for (absl::string_view field : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    field = absl::StripAsciiWhitespace(field);
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(field, absl::MaxSplits('=', 1));
    const absl::string_view key = kv.first, value = kv.second;
    if (key == "uid" || key == "gid") {
      if (!matches) return error(absl::StrCat("'", key, "' has no place here (this rule covers every other pod)"));
      if (rule.match != TenantRule::Match::kAny) return error("a rule matches by one uid or one gid, not both");
      if (!absl::SimpleAtoi(value, &rule.id)) return error(absl::StrCat(key, " must be a number, not '", value, "'"));
      rule.match = key == "uid" ? TenantRule::Match::kUid : TenantRule::Match::kGid;
      rule.name = absl::StrCat(key, "=", rule.id);
    } else if (key == "ceiling" || key == "class") {
      TrafficClass c;
      if (!ParseClassName(value, &c)) {
        return error(absl::StrCat("unknown class '", value, "' for ", key, " (latency, bulk or background)"));
      }
      (key == "ceiling" ? rule.ceiling : rule.default_class) = c;
      class_set |= key == "class";
    } else if (key == "weight") {
      if (!ParseWeight(value, &rule.weight)) {
        return error(absl::StrCat("weight must be 1..", kMaxWeight, ", not '", value, "'"));
      }
    } else if (key == "inflight") {
      if (!ParseBytes(value, &rule.inflight_cap) || rule.inflight_cap == 0) {
        return error(absl::StrCat("inflight must be a byte count such as 64MiB, not '", value, "'"));
      }
      if (rule.inflight_cap < max_op_bytes) {
        return error(absl::StrCat("inflight=", value, " is smaller than one op (--fabric_max_op_bytes=", max_op_bytes,
                                  "): raise it or lower --fabric_max_op_bytes"));
      }
    } else if (key == "rate") {
      if (!ParseBytes(value, &rule.rate_cap) || rule.rate_cap == 0) {
        return error(absl::StrCat("rate must be bytes per second such as 2GB, not '", value, "'"));
      }
    } else {
      return error(
          absl::StrCat("unknown field '", field, "' (uid, gid, ceiling, class, weight, inflight, rate; key=value)"));
    }
  }
  if (matches && rule.match == TenantRule::Match::kAny) return error("a rule needs uid=N or gid=N");
  if (!class_set && rule.default_class < rule.ceiling) rule.default_class = rule.ceiling;
  if (rule.default_class < rule.ceiling) {
    return error(absl::StrCat("class=", ClassName(rule.default_class), " is above ceiling=", ClassName(rule.ceiling)));
  }
  return rule;
}

}  // namespace

bool ParseBytes(absl::string_view text, uint64_t* out) {
  static constexpr std::pair<const char*, uint64_t> kUnits[] = {{"KiB", 1ull << 10}, {"MiB", 1ull << 20},
                                                                {"GiB", 1ull << 30}, {"KB", 1000ull},
                                                                {"MB", 1000000ull},  {"GB", 1000000000ull}};
  uint64_t unit = 1;
  for (const auto& [suffix, scale] : kUnits) {
    if (absl::ConsumeSuffix(&text, suffix)) {
      unit = scale;
      break;
    }
  }
  uint64_t n;
  if (!absl::SimpleAtoi(text, &n) || n > UINT64_MAX / unit) return false;
  *out = n * unit;
  return true;
}

const TenantRule& QosPolicy::Match(uid_t uid, gid_t gid) const {
  for (const TenantRule& r : rules) {
    if ((r.match == TenantRule::Match::kUid && r.id == uid) || (r.match == TenantRule::Match::kGid && r.id == gid)) {
      return r;
    }
  }
  return fallback;
}

absl::StatusOr<QosPolicy> ParseQosPolicy(const QosFlags& flags) {
  QosPolicy policy;
  policy.scheduling.enabled = flags.enabled;
  if (flags.window_bytes == 0) {
    return absl::InvalidArgumentError("--qos_window_bytes must be >= 1 (bytes of bulk and background posted per NIC)");
  }
  if (flags.latency_window_bytes == 0 || flags.latency_window_bytes > flags.window_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("--qos_latency_window_bytes must be 1..--qos_window_bytes (", flags.window_bytes, ")"));
  }
  policy.scheduling.window_bytes = flags.window_bytes;
  policy.scheduling.latency_window_bytes = flags.latency_window_bytes;
  int n = 0;
  for (absl::string_view text : absl::StrSplit(flags.tenants, ';', absl::SkipWhitespace())) {
    ++n;
    absl::StatusOr<TenantRule> rule =
        ParseRule(text, /*matches=*/true, flags.max_op_bytes, "--qos_tenants", absl::StrCat("rule ", n));
    if (!rule.ok()) return rule.status();
    for (const TenantRule& earlier : policy.rules) {
      if (earlier.name == rule->name) {
        return absl::InvalidArgumentError(absl::StrCat("--qos_tenants: rule ", n, ": ", rule->name,
                                                       " already has a rule (the first would always win)"));
      }
    }
    policy.rules.push_back(*std::move(rule));
  }
  absl::StatusOr<TenantRule> fallback = ParseRule(flags.default_tenant, /*matches=*/false, flags.max_op_bytes,
                                                  "--qos_default_tenant", "the default rule");
  if (!fallback.ok()) return fallback.status();
  policy.fallback = *std::move(fallback);
  for (absl::string_view field : absl::StrSplit(flags.class_weights, ',', absl::SkipWhitespace())) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(field, absl::MaxSplits('=', 1));
    TrafficClass c;
    if (!ParseClassName(absl::StripAsciiWhitespace(kv.first), &c)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--qos_class_weights: unknown class '", kv.first, "' (latency, bulk or background)"));
    }
    if (!ParseWeight(kv.second, &policy.scheduling.class_weights[ClassIndex(c)])) {
      return absl::InvalidArgumentError(
          absl::StrCat("--qos_class_weights: ", kv.first, " must be 1..", kMaxWeight, ", not '", kv.second, "'"));
    }
  }
  return policy;
}

std::string FormatClassWeights(const QosScheduling& scheduling) {
  std::string out;
  for (int c = 0; c < kTrafficClasses; ++c) {
    absl::StrAppend(&out, c == 0 ? "" : ",", ClassName(static_cast<TrafficClass>(c)), "=", scheduling.class_weights[c]);
  }
  return out;
}

absl::StatusOr<TrafficClass> ResolveClass(const TenantRule& rule, v1::TrafficClass asked) {
  if (asked == v1::TRAFFIC_CLASS_UNSPECIFIED) return rule.default_class;
  TrafficClass c;
  if (!FromProto(asked, &c)) {
    return absl::InvalidArgumentError(absl::StrCat("traffic_class ", static_cast<int>(asked), " is not a class"));
  }
  if (c < rule.ceiling) {
    return absl::PermissionDeniedError(
        absl::StrCat("traffic class ", ClassName(c), " is above this pod's ceiling ", ClassName(rule.ceiling),
                     " (agent rule ", rule.name, " of --qos_tenants / --qos_default_tenant): ask for ",
                     ClassName(rule.ceiling), " or below, or have the operator raise the rule's ceiling"));
  }
  return c;
}

}  // namespace ferry
