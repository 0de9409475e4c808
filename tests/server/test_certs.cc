#include "tests/server/test_certs.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace flce::test {
namespace {

TestCerts Make() {
  TestCerts certs;
  std::string dir =
      (std::filesystem::temp_directory_path() / absl::StrCat("flce-certs-", getpid())).string();
  std::filesystem::create_directories(dir);
  certs.dir = dir;
  auto path = [&dir](const char* name) { return absl::StrCat(dir, "/", name); };
  certs.ca_cert = path("ca.crt");
  certs.server_cert = path("server.crt");
  certs.server_key = path("server.key");
  certs.client_cert = path("client.crt");
  certs.client_key = path("client.key");
  certs.other_ca_cert = path("other-ca.crt");
  // EC keys: generated in milliseconds, unlike RSA.
  const std::string key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  std::string script = absl::StrCat(
      "set -e; cd '", dir, "'\n", "openssl req -x509 ", key,
      " -keyout ca.key -out ca.crt -days 2 -subj '/CN=flce test CA'\n", "openssl req -x509 ", key,
      " -keyout other-ca.key -out other-ca.crt -days 2 -subj '/CN=flce other CA'\n", "openssl req ",
      key, " -keyout server.key -out server.csr -subj '/CN=localhost'\n",
      "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > server.ext\n",
      "openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 "
      "-extfile server.ext -out server.crt\n",
      "openssl req ", key, " -keyout client.key -out client.csr -subj '/CN=flce test client'\n",
      "openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 "
      "-out client.crt\n");
  std::string command = absl::StrCat("sh -c \"$(cat <<'FLCE_EOF'\n", script, "FLCE_EOF\n)\" > '",
                                     dir, "/openssl.log' 2>&1");
  int rc = std::system(command.c_str());
  if (rc != 0) {
    certs.error = absl::StrCat("openssl failed (", rc, "): ", ReadTextFile(path("openssl.log")));
    return certs;
  }
  certs.ok = true;
  return certs;
}

}  // namespace

const TestCerts& TestCerts::Get() {
  static const TestCerts* certs = [] {
    auto* made = new TestCerts(Make());
    static std::string dir = made->dir;
    std::atexit([] {
      std::error_code ignored;
      std::filesystem::remove_all(dir, ignored);
    });
    return made;
  }();
  return *certs;
}

std::string ReadTextFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace flce::test
