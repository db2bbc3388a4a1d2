#include "common/member_credentials.h"

#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <openssl/sha.h>

#include <algorithm>
#include <cstdlib>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace shoal {
namespace {

constexpr size_t kSecretHexDigits = 64;

std::string DigestOf(absl::string_view text) {
  std::string digest(SHA256_DIGEST_LENGTH, '\0');
  SHA256(reinterpret_cast<const unsigned char*>(text.data()), text.size(),
         reinterpret_cast<unsigned char*>(digest.data()));
  return digest;
}

bool SameDigest(const std::string& a, const std::string& b) {
  return a.size() == b.size() && !a.empty() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

absl::Status NotCurrent(absl::string_view worker_id, absl::string_view why) {
  // Never echo the credential; worker ids are short and validated by the
  // coordinator, but a stranger's may be anything: cut it.
  return absl::PermissionDeniedError(
      absl::StrCat("member credential of '", absl::CHexEscape(worker_id.substr(0, 32)),
                   "' is not current: ", why, " (only current members of the run may read)"));
}

}  // namespace

absl::StatusOr<ParsedCredential> ParseCredential(absl::string_view text) {
  std::vector<absl::string_view> parts = absl::StrSplit(text, '.');
  ParsedCredential p;
  if (parts.size() != 3 || !absl::SimpleAtoi(parts[0], &p.epoch) ||
      !absl::SimpleAtoi(parts[1], &p.version) || p.epoch == 0 || p.version == 0 ||
      parts[2].size() != kSecretHexDigits) {
    return absl::InvalidArgumentError("not a member credential (<epoch>.<version>.<64 hex>)");
  }
  for (char c : parts[2]) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) {
      return absl::InvalidArgumentError("not a member credential (<epoch>.<version>.<64 hex>)");
    }
  }
  return p;
}

std::string RandomCredentialSecret() {
  unsigned char bytes[kSecretHexDigits / 2];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) {
    // OpenSSL's generator failing is not something to run a secure service
    // through.
    std::abort();
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(kSecretHexDigits);
  for (unsigned char b : bytes) {
    hex.push_back(kHex[b >> 4]);
    hex.push_back(kHex[b & 15]);
  }
  return hex;
}

// ---- MemberRoster

MemberRoster::MemberRoster(uint64_t epoch, std::function<std::string()> secret)
    : epoch_(epoch == 0 ? 1 : epoch), secret_(std::move(secret)) {}

std::string MemberRoster::Issue(const std::string& worker_id, shoal::v1::MemberUpdate* update) {
  ++version_;
  std::string text = absl::StrCat(epoch_, ".", version_, ".", secret_());
  Entry& e = current_[worker_id];
  e.version = version_;
  e.digest = DigestOf(text);
  update->Clear();
  update->set_epoch(epoch_);
  update->set_version(version_);
  auto* entry = update->add_entries();
  entry->set_worker_id(worker_id);
  entry->set_version(version_);
  entry->set_credential_sha256(e.digest);
  return text;
}

bool MemberRoster::Revoke(const std::string& worker_id, shoal::v1::MemberUpdate* update) {
  auto it = current_.find(worker_id);
  if (it == current_.end()) return false;
  current_.erase(it);
  ++version_;
  update->Clear();
  update->set_epoch(epoch_);
  update->set_version(version_);
  auto* entry = update->add_entries();
  entry->set_worker_id(worker_id);
  entry->set_version(version_);
  return true;
}

shoal::v1::MemberUpdate MemberRoster::Full() const {
  shoal::v1::MemberUpdate full;
  full.set_epoch(epoch_);
  full.set_version(version_);
  full.set_full(true);
  for (const auto& [id, e] : current_) {
    auto* entry = full.add_entries();
    entry->set_worker_id(id);
    entry->set_version(e.version);
    entry->set_credential_sha256(e.digest);
  }
  return full;
}

// ---- MemberSet

void MemberSet::Enable() {
  absl::MutexLock lock(&mu_);
  enabled_ = true;
}

bool MemberSet::enabled() const {
  absl::MutexLock lock(&mu_);
  return enabled_;
}

void MemberSet::Apply(const shoal::v1::MemberUpdate& update) {
  if (update.epoch() == 0) return;
  absl::MutexLock lock(&mu_);
  if (update.epoch() != epoch_) {
    // A change of another coordinator start than the list this set holds
    // cannot be placed (the new start's full list comes with the session);
    // with no list yet, the change starts one.
    if (!update.full() && epoch_ != 0) return;
    epoch_ = update.epoch();
    complete_ = 0;
    ahead_.clear();
    version_ = 0;
    entries_.clear();
  }
  for (const shoal::v1::MemberEntry& e : update.entries()) {
    Entry& stored = entries_[e.worker_id()];
    if (e.version() > stored.version) {
      stored.version = e.version();
      stored.digest = e.credential_sha256();
    }
  }
  if (update.full()) {
    if (update.version() > complete_) {
      complete_ = update.version();
      // Not in the full list and not changed after it: no longer a member
      // (a credential up to complete_ without an entry is refused anyway).
      absl::flat_hash_map<std::string, bool> listed;
      for (const shoal::v1::MemberEntry& e : update.entries()) listed[e.worker_id()] = true;
      for (auto it = entries_.begin(); it != entries_.end();) {
        const bool covered = it->second.version <= complete_;
        if (covered && (!listed.contains(it->first) || it->second.digest.empty())) {
          entries_.erase(it++);
        } else {
          ++it;
        }
      }
    }
  } else if (update.version() > complete_) {
    ahead_.insert(update.version());
  }
  // Changes heard out of order close their gap.
  while (!ahead_.empty() && *ahead_.begin() <= complete_ + 1) {
    complete_ = std::max(complete_, *ahead_.begin());
    ahead_.erase(ahead_.begin());
  }
  // A gap that never fills (a change lost with a broken session) waits for
  // the next full list; keep the set bounded meanwhile.
  if (ahead_.size() > 65536) ahead_.clear();
  version_ = std::max(version_, update.version());
}

absl::Status MemberSet::Check(absl::string_view worker_id, absl::string_view credential) const {
  absl::StatusOr<ParsedCredential> parsed = ParseCredential(credential);
  if (!parsed.ok()) return NotCurrent(worker_id, "malformed");
  const std::string digest = DigestOf(credential);
  absl::MutexLock lock(&mu_);
  if (!enabled_) return absl::OkStatus();
  if (epoch_ == 0) {
    return absl::UnavailableError(
        "this worker has not received the run's member list from the coordinator yet; retry");
  }
  if (parsed->epoch < epoch_) {
    // Epochs are the coordinator's start times: every member re-joins after
    // a restart or failover, and this worker already holds the newer list.
    return NotCurrent(worker_id, "issued by an earlier coordinator start; join again");
  }
  if (parsed->epoch > epoch_) {
    return absl::UnavailableError(
        "member credential from a newer coordinator start than this worker's member list (a "
        "restart or failover in progress); retry");
  }
  auto it = entries_.find(std::string(worker_id));
  if (it != entries_.end()) {
    if (SameDigest(it->second.digest, digest)) return absl::OkStatus();
    if (parsed->version <= it->second.version) {
      return NotCurrent(worker_id, it->second.digest.empty() ? "the worker was removed from the run"
                                                             : "replaced by a newer one");
    }
  }
  if (parsed->version <= complete_) {
    return NotCurrent(worker_id, it == entries_.end() ? "not a member" : "not its credential");
  }
  return absl::UnavailableError(absl::StrCat(
      "member credential newer than this worker's member list (version ", version_, "); retry"));
}

absl::Status MemberSet::CheckHeader(std::optional<absl::string_view> value) const {
  if (!enabled()) return absl::OkStatus();
  if (!value.has_value()) {
    return absl::PermissionDeniedError(
        "only current members of the run may read: no `x-shoal-member` credential (a worker gets "
        "one when it joins)");
  }
  const size_t colon = value->find(':');
  if (colon == absl::string_view::npos) {
    return absl::PermissionDeniedError("`x-shoal-member` is not <worker_id>:<credential>");
  }
  return Check(value->substr(0, colon), value->substr(colon + 1));
}

uint64_t MemberSet::version() const {
  absl::MutexLock lock(&mu_);
  return version_;
}

size_t MemberSet::size() const {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [id, e] : entries_) n += !e.digest.empty();
  return n;
}

// ---- MemberCredentialHolder

void MemberCredentialHolder::Set(const std::string& worker_id, const std::string& credential) {
  absl::MutexLock lock(&mu_);
  value_ = credential.empty() ? std::string() : absl::StrCat(worker_id, ":", credential);
}

std::string MemberCredentialHolder::Value() const {
  absl::MutexLock lock(&mu_);
  return value_;
}

}  // namespace shoal
