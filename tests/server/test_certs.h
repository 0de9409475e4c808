// Test certificates made with the openssl CLI in a temporary directory: a CA,
// a server certificate for 127.0.0.1 and localhost signed by it, a client
// certificate signed by it, and an unrelated CA that signed nothing here.
//
// Usage:
//   const TestCerts& certs = TestCerts::Get();   // made once per process
//   ASSERT_TRUE(certs.ok) << certs.error;
//   config.tls_cert = certs.server_cert;  config.tls_key = certs.server_key;
#ifndef FLCE_TESTS_SERVER_TEST_CERTS_H_
#define FLCE_TESTS_SERVER_TEST_CERTS_H_

#include <string>

namespace flce::test {

struct TestCerts {
  bool ok = false;
  std::string error;  // what failed when !ok
  std::string dir;
  std::string ca_cert;  // paths of PEM files
  std::string server_cert;
  std::string server_key;
  std::string client_cert;
  std::string client_key;
  std::string other_ca_cert;

  static const TestCerts& Get();
};

// A whole file's bytes ("" when unreadable).
std::string ReadTextFile(const std::string& path);

}  // namespace flce::test

#endif  // FLCE_TESTS_SERVER_TEST_CERTS_H_
