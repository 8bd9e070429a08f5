// FERRY_RETURN_IF_ERROR / FERRY_ASSIGN_OR_RETURN: the agent's one way to pass an error up
// unchanged (its code, message and payloads). To add words, use WithPrefix
// (status_prefix.h), which keeps the payloads too.
//
//   FERRY_RETURN_IF_ERROR(CheckRange(offset, length));
//   FERRY_ASSIGN_OR_RETURN(std::shared_ptr<Region> region, regions.Lookup(id));
//   FERRY_ASSIGN_OR_RETURN(const Token token, Token::FromBytes(bytes, "dst.token"));
//
// In a function returning absl::Status or absl::StatusOr<T>. FERRY_ASSIGN_OR_RETURN
// declares its left side (or assigns an existing variable) from the value moved out of
// the StatusOr; it is a statement, so not the body of an unbraced if.
#ifndef FERRY_AGENT_COMMON_STATUS_MACROS_H_
#define FERRY_AGENT_COMMON_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define FERRY_RETURN_IF_ERROR(expr)                                   \
  do {                                                                \
    if (::absl::Status ferry_status_ = (expr); !ferry_status_.ok()) { \
      return ferry_status_;                                           \
    }                                                                 \
  } while (0)

#define FERRY_STATUS_CONCAT_INNER_(a, b) a##b
#define FERRY_STATUS_CONCAT_(a, b) FERRY_STATUS_CONCAT_INNER_(a, b)

#define FERRY_ASSIGN_OR_RETURN(lhs, rexpr) \
  FERRY_ASSIGN_OR_RETURN_IMPL_(FERRY_STATUS_CONCAT_(ferry_statusor_, __LINE__), lhs, rexpr)

#define FERRY_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                 \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = *std::move(statusor)

#endif  // FERRY_AGENT_COMMON_STATUS_MACROS_H_
