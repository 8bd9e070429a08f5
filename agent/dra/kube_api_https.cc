// KubeApi over HTTPS with OpenSSL (the library gRPC already loads). One connection per
// request, HTTP/1.0: the API server then answers with a plain body and closes, so there
// is no chunked encoding or keep-alive to handle for the handful of reads ferry makes.
#include <arpa/inet.h>
#include <netdb.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include <google/protobuf/util/json_util.h>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "agent/dra/kube_api.h"
#include "proto/ferry/v1/dra.pb.h"

namespace ferry {
namespace {

constexpr size_t kMaxResponseBytes = 64 << 20;

std::string OpenSslError() {
  const unsigned long e = ERR_get_error();  // NOLINT(runtime/int): OpenSSL's type
  if (e == 0) return "no detail";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof(buf));
  return buf;
}

bool IsIpAddress(const std::string& host) {
  unsigned char buf[sizeof(struct in6_addr)];
  return inet_pton(AF_INET, host.c_str(), buf) == 1 || inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

absl::StatusOr<int> Connect(const KubeApiEndpoint& ep) {
  struct addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  struct addrinfo* found = nullptr;
  const std::string port = absl::StrCat(ep.port);
  if (int rc = getaddrinfo(ep.host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return absl::UnavailableError(absl::StrCat("API server ", ep.host, ": ", gai_strerror(rc)));
  }
  absl::Cleanup free_found = [found] { freeaddrinfo(found); };
  int err = 0;
  for (struct addrinfo* a = found; a != nullptr; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    // Blocking I/O bounded by the socket's timeouts: connect() honours SO_SNDTIMEO.
    struct timeval tv = {ep.timeout_ms / 1000, (ep.timeout_ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) return fd;
    err = errno;
    close(fd);
  }
  return absl::UnavailableError(absl::StrCat("API server ", ep.host, ":", ep.port, ": ", strerror(err)));
}

absl::StatusCode CodeOfHttp(int http) {
  switch (http) {
    case 401:
    case 403:
      return absl::StatusCode::kPermissionDenied;
    case 404:
      return absl::StatusCode::kNotFound;
    case 429:
    case 500:
    case 503:
    case 504:
      return absl::StatusCode::kUnavailable;
    default:
      return absl::StatusCode::kFailedPrecondition;
  }
}

class HttpsKubeApi : public KubeApi {
 public:
  explicit HttpsKubeApi(KubeApiEndpoint endpoint) : ep_(std::move(endpoint)) {}

  absl::StatusOr<std::string> Get(const std::string& path) override {
    SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
    if (ctx == nullptr) return absl::InternalError(absl::StrCat("TLS: ", OpenSslError()));
    absl::Cleanup free_ctx = [ctx] { SSL_CTX_free(ctx); };
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
    if (SSL_CTX_load_verify_locations(ctx, ep_.ca_file.c_str(), nullptr) != 1) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot load the API server's CA from ", ep_.ca_file, ": ", OpenSslError()));
    }
    absl::StatusOr<int> fd = Connect(ep_);
    if (!fd.ok()) return fd.status();
    absl::Cleanup close_fd = [fd = *fd] { close(fd); };
    SSL* ssl = SSL_new(ctx);
    if (ssl == nullptr) return absl::InternalError(absl::StrCat("TLS: ", OpenSslError()));
    absl::Cleanup free_ssl = [ssl] { SSL_free(ssl); };
    SSL_set_fd(ssl, *fd);
    X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
    if (IsIpAddress(ep_.host)) {
      X509_VERIFY_PARAM_set1_ip_asc(param, ep_.host.c_str());
    } else {
      SSL_set_tlsext_host_name(ssl, ep_.host.c_str());
      X509_VERIFY_PARAM_set1_host(param, ep_.host.c_str(), 0);
    }
    if (SSL_connect(ssl) != 1) {
      const long verify = SSL_get_verify_result(ssl);  // NOLINT(runtime/int): OpenSSL's type
      return absl::UnavailableError(absl::StrCat(
          "TLS handshake with the API server ", ep_.host, ":", ep_.port,
          " failed: ", verify != X509_V_OK ? X509_verify_cert_error_string(verify) : OpenSslError().c_str()));
    }
    const std::string request =
        absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: ", ep_.host, "\r\nAuthorization: Bearer ", ep_.token,
                     "\r\nAccept: application/json\r\nUser-Agent: ferry\r\n\r\n");
    if (SSL_write(ssl, request.data(), static_cast<int>(request.size())) != static_cast<int>(request.size())) {
      return absl::UnavailableError(absl::StrCat("sending to the API server: ", OpenSslError()));
    }
    std::string response;
    char buf[16384];
    for (;;) {
      const int n = SSL_read(ssl, buf, sizeof(buf));
      if (n > 0) {
        response.append(buf, n);
        if (response.size() > kMaxResponseBytes) {
          return absl::ResourceExhaustedError(absl::StrCat("GET ", path, ": response over 64 MiB"));
        }
        continue;
      }
      const int e = SSL_get_error(ssl, n);
      // The server closes after its answer; the Content-Length check below catches a cut.
      if (e == SSL_ERROR_ZERO_RETURN) break;
      if (e == SSL_ERROR_SSL && ERR_GET_REASON(ERR_peek_error()) == SSL_R_UNEXPECTED_EOF_WHILE_READING) break;
      return absl::UnavailableError(absl::StrCat(
          "GET ", path, ": reading the response: ",
          e == SSL_ERROR_SYSCALL ? (errno == EAGAIN ? "timed out" : strerror(errno)) : OpenSslError().c_str()));
    }
    return ParseResponse(path, response);
  }

 private:
  static absl::StatusOr<std::string> ParseResponse(const std::string& path, const std::string& response) {
    const size_t head_end = response.find("\r\n\r\n");
    if (head_end == std::string::npos) {
      return absl::UnavailableError(absl::StrCat("GET ", path, ": incomplete response from the API server"));
    }
    std::vector<absl::string_view> head = absl::StrSplit(absl::string_view(response).substr(0, head_end), "\r\n");
    std::vector<absl::string_view> status_line = absl::StrSplit(head[0], absl::MaxSplits(' ', 2));
    int http = 0;
    if (status_line.size() < 2 || !absl::StartsWith(status_line[0], "HTTP/") ||
        !absl::SimpleAtoi(status_line[1], &http)) {
      return absl::UnavailableError(absl::StrCat("GET ", path, ": not an HTTP response: ", head[0]));
    }
    std::string body = response.substr(head_end + 4);
    size_t content_length = body.size();
    for (size_t i = 1; i < head.size(); ++i) {
      std::vector<absl::string_view> kv = absl::StrSplit(head[i], absl::MaxSplits(':', 1));
      if (kv.size() != 2) continue;
      const std::string key = absl::AsciiStrToLower(absl::StripAsciiWhitespace(kv[0]));
      const absl::string_view value = absl::StripAsciiWhitespace(kv[1]);
      if (key == "content-length" && !absl::SimpleAtoi(value, &content_length)) content_length = SIZE_MAX;
      if (key == "transfer-encoding" && value != "identity") {
        return absl::UnavailableError(absl::StrCat("GET ", path, ": unexpected Transfer-Encoding ", value));
      }
    }
    if (content_length != body.size()) {
      return absl::UnavailableError(
          absl::StrCat("GET ", path, ": response cut short (", body.size(), " of ", content_length, " bytes)"));
    }
    if (http == 200) return body;
    v1::ApiStatus status;
    google::protobuf::util::JsonParseOptions options;
    options.ignore_unknown_fields = true;
    const std::string message =
        google::protobuf::util::JsonStringToMessage(body, &status, options).ok() && !status.message().empty()
            ? status.message()
            : body.substr(0, 300);
    return absl::Status(CodeOfHttp(http), absl::StrCat("GET ", path, ": HTTP ", http, ": ", message));
  }

  const KubeApiEndpoint ep_;
};

absl::StatusOr<std::string> ReadSmallFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream text;
  text << in.rdbuf();
  return std::string(absl::StripAsciiWhitespace(text.str()));
}

}  // namespace

absl::StatusOr<KubeApiEndpoint> InClusterEndpoint(const std::string& service_account_dir) {
  KubeApiEndpoint ep;
  const char* host = getenv("KUBERNETES_SERVICE_HOST");
  const char* port = getenv("KUBERNETES_SERVICE_PORT");
  if (host == nullptr || *host == '\0') {
    return absl::FailedPreconditionError("KUBERNETES_SERVICE_HOST is not set: not running in a Kubernetes pod");
  }
  ep.host = host;
  if (port != nullptr && *port != '\0' && (!absl::SimpleAtoi(port, &ep.port) || ep.port <= 0 || ep.port > 65535)) {
    return absl::InvalidArgumentError(absl::StrCat("KUBERNETES_SERVICE_PORT '", port, "' is not a port"));
  }
  absl::StatusOr<std::string> token = ReadSmallFile(service_account_dir + "/token");
  if (!token.ok() || token->empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("no service account token at ", service_account_dir,
                     "/token: the container needs its service account token mounted (the chart mounts one into "
                     "the claimed-devices init container only)"));
  }
  ep.token = *std::move(token);
  ep.ca_file = service_account_dir + "/ca.crt";
  return ep;
}

std::unique_ptr<KubeApi> NewHttpsKubeApi(KubeApiEndpoint endpoint) {
  return std::make_unique<HttpsKubeApi>(std::move(endpoint));
}

}  // namespace ferry
