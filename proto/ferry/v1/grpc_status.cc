#include "proto/ferry/v1/grpc_status.h"

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "proto/ferry/v1/status_details.pb.h"

namespace ferry {

grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  v1::StatusDetails details;
  s.ForEachPayload([&details](absl::string_view url, const absl::Cord& value) {
    if (!absl::StartsWith(url, kFerryPayloadPrefix)) return;
    v1::StatusPayload* p = details.add_details();
    p->set_type_url(std::string(url));
    p->set_value(std::string(value));
  });
  const auto code = static_cast<grpc::StatusCode>(s.code());
  if (details.details().empty()) return grpc::Status(code, std::string(s.message()));
  details.set_code(static_cast<int32_t>(s.code()));
  details.set_message(std::string(s.message()));
  return grpc::Status(code, std::string(s.message()), details.SerializeAsString());
}

absl::Status FromGrpcStatus(const grpc::Status& s, absl::string_view prefix) {
  if (s.ok()) return absl::OkStatus();
  absl::Status out(static_cast<absl::StatusCode>(s.error_code()), absl::StrCat(prefix, s.error_message()));
  v1::StatusDetails details;
  if (!s.error_details().empty() && details.ParseFromString(s.error_details())) {
    for (const v1::StatusPayload& p : details.details()) {
      if (absl::StartsWith(p.type_url(), kFerryPayloadPrefix)) out.SetPayload(p.type_url(), absl::Cord(p.value()));
    }
  }
  return out;
}

}  // namespace ferry
