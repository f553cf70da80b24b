#include "agent/runtime/container_ref.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "tests/unit/agent/runtime/test_util.h"

namespace siphon::agent::runtime {
namespace {

using ::testing::HasSubstr;
using testing::msg;

constexpr char kRefId[] = "3f4c2a1b9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b";

TEST(RuntimeNameTest, RoundTrips) {
  for (RuntimeKind k : {RuntimeKind::kContainerd, RuntimeKind::kDocker, RuntimeKind::kCrio}) {
    auto back = parseRuntimeName(runtimeName(k));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, k);
  }
  EXPECT_EQ(runtimeName(RuntimeKind::kCrio), "cri-o");
}

TEST(RuntimeNameTest, AutoAndUnknownAreNotRuntimes) {
  for (const char* name : {"auto", "crio", "Docker", "", "podman"}) {
    auto k = parseRuntimeName(name);
    EXPECT_EQ(k.status().code(), absl::StatusCode::kInvalidArgument) << name;
  }
}

TEST(ContainerRefTest, BareIdHasNoRuntime) {
  auto ref = parseContainerRef(kRefId);
  ASSERT_TRUE(ref.ok()) << ref.status();
  EXPECT_EQ(ref->id, kRefId);
  EXPECT_FALSE(ref->runtime.has_value());
}

TEST(ContainerRefTest, KubernetesPrefixesPickTheRuntime) {
  struct Case {
    std::string text;
    RuntimeKind kind;
  } cases[] = {
      {std::string("containerd://") + kRefId, RuntimeKind::kContainerd},
      {std::string("docker://") + kRefId, RuntimeKind::kDocker},
      {std::string("cri-o://") + kRefId, RuntimeKind::kCrio},
  };
  for (const Case& c : cases) {
    auto ref = parseContainerRef(c.text);
    ASSERT_TRUE(ref.ok()) << c.text << ": " << ref.status();
    EXPECT_EQ(ref->id, kRefId);
    ASSERT_TRUE(ref->runtime.has_value());
    EXPECT_EQ(*ref->runtime, c.kind);
  }
}

TEST(ContainerRefTest, DockerNamesAndShortIdsAreAccepted) {
  for (const char* id : {"web", "my_app.1", "abc-def", "3f4c2a1b9e8d", "A1"}) {
    auto ref = parseContainerRef(id);
    ASSERT_TRUE(ref.ok()) << id << ": " << ref.status();
    EXPECT_EQ(ref->id, id);
  }
}

TEST(ContainerRefTest, UnknownPrefixIsRefused) {
  auto ref = parseContainerRef("rkt://abc");
  ASSERT_EQ(ref.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(msg(ref.status()), HasSubstr("rkt://abc"));
  EXPECT_THAT(msg(ref.status()), HasSubstr("containerd, docker or cri-o"));
}

TEST(ContainerRefTest, EmptyIdIsRefused) {
  EXPECT_EQ(parseContainerRef("").status().code(), absl::StatusCode::kInvalidArgument);
  auto ref = parseContainerRef("containerd://");
  ASSERT_EQ(ref.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(msg(ref.status()), HasSubstr("empty"));
}

TEST(ContainerRefTest, CharactersThatCouldEscapeAPathOrUrlAreRefused) {
  for (const char* id : {"../etc", "a/b", "a b", "a?b", "a%2fb", "a\nb", ".hidden", "-x", "_x",
                         "a:b", "containerd:/x", "docker://a/b"}) {
    auto ref = parseContainerRef(id);
    EXPECT_EQ(ref.status().code(), absl::StatusCode::kInvalidArgument) << id;
  }
}

TEST(ContainerRefTest, LengthIsBounded) {
  EXPECT_TRUE(parseContainerRef(std::string(kMaxContainerIdLength, 'a')).ok());
  auto ref = parseContainerRef(std::string(kMaxContainerIdLength + 1, 'a'));
  ASSERT_EQ(ref.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(msg(ref.status()), HasSubstr("longer than 128"));
}

}  // namespace
}  // namespace siphon::agent::runtime
