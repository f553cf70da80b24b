#include "agent/steal/iptables/iptables_rules.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace siphon::agent::steal {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

const ChainNames kChains = chainNamesFor(4026532481, "a1b2c3");  // 0xf0000281

TEST(ChainNames, DerivedFromTheInodeAndTheOwnerAndShortEnough) {
  EXPECT_EQ(kChains.pre, "SIPHON_f0000281_a1b2c3_PRE");
  EXPECT_EQ(kChains.out, "SIPHON_f0000281_a1b2c3_OUT");
  ChainNames big = chainNamesFor(0xffffffffffffffffULL, "ffffff");
  EXPECT_LE(big.pre.size(), 28u);
  EXPECT_LE(big.out.size(), 28u);
  EXPECT_NE(chainNamesFor(1, "a1b2c3").pre, chainNamesFor(2, "a1b2c3").pre);
  // Two agents on one target: different chains.
  EXPECT_NE(chainNamesFor(1, "a1b2c3").pre, chainNamesFor(1, "0f0f0f").pre);
  EXPECT_NE(chainNamesFor(1, "a1b2c3").out, chainNamesFor(1, "0f0f0f").out);
  // The names of agents before owner ids, which the stale sweep removes.
  EXPECT_EQ(chainNamesFor(4026532481, "").pre, "SIPHON_f0000281_PRE");
  EXPECT_EQ(chainPrefixFor(4026532481), "SIPHON_f0000281_");
  EXPECT_EQ(ownerLockName(4026532481, "a1b2c3"), "siphon-steal-f0000281-a1b2c3");
}

TEST(ChainNames, OwnerIds) {
  EXPECT_TRUE(validOwnerId("a1b2c3"));
  EXPECT_TRUE(validOwnerId("000000"));
  EXPECT_FALSE(validOwnerId(""));
  EXPECT_FALSE(validOwnerId("A1B2C3"));
  EXPECT_FALSE(validOwnerId("a1b2c"));
  EXPECT_FALSE(validOwnerId("a1b2c3d"));
  EXPECT_FALSE(validOwnerId("a1b2_3"));
}

TEST(Save, FindsTheOwnersOfTheTargetsChains) {
  constexpr char kTwo[] =
      "*filter\n:SIPHON_f0000281_999999_PRE - [0:0]\nCOMMIT\n"  // not nat
      "*nat\n"
      ":PREROUTING ACCEPT [0:0]\n"
      ":SIPHON_f0000281_a1b2c3_PRE - [0:0]\n"
      ":SIPHON_f0000281_a1b2c3_OUT - [0:0]\n"
      ":SIPHON_f0000281_0f0f0f_OUT - [0:0]\n"
      ":SIPHON_f0000281_PRE - [0:0]\n"         // an older agent's: owner ""
      ":SIPHON_deadbeef_123456_PRE - [0:0]\n"  // another target's
      ":SIPHON_f0000281_XYZ_PRE - [0:0]\n"     // not an owner id
      ":SIPHON_f0000281_a1b2c3_FOO - [0:0]\n"
      "-A PREROUTING -j SIPHON_f0000281_a1b2c3_PRE\n"
      "COMMIT\n";
  EXPECT_THAT(ownersInSave(kTwo, 4026532481), ElementsAre("", "0f0f0f", "a1b2c3"));
  EXPECT_THAT(ownersInSave(kTwo, 0xdeadbeef), ElementsAre("123456"));
  EXPECT_THAT(ownersInSave("", 4026532481), ElementsAre());
}

TEST(Save, AnotherOwnersChainsOnTheSameTargetAreNotOurs) {
  const std::string other =
      "*nat\n:SIPHON_f0000281_0f0f0f_PRE - [0:0]\n"
      "-A PREROUTING -j SIPHON_f0000281_0f0f0f_PRE\nCOMMIT\n";
  EXPECT_TRUE(parseNatSave(other, kChains).empty());
}

TEST(Rules, InstallDeclaresChainsExemptsOurMarkJumpsLastInPreroutingFirstInOutput) {
  EXPECT_EQ(installRules(kChains),
            "*nat\n"
            ":SIPHON_f0000281_a1b2c3_PRE - [0:0]\n"
            ":SIPHON_f0000281_a1b2c3_OUT - [0:0]\n"
            "-A SIPHON_f0000281_a1b2c3_PRE -m conntrack --ctstate INVALID -j RETURN\n"
            "-A SIPHON_f0000281_a1b2c3_OUT -m mark --mark 0x53490000/0xffff0000 -j RETURN\n"
            "-A PREROUTING -j SIPHON_f0000281_a1b2c3_PRE\n"
            "-I OUTPUT 1 -j SIPHON_f0000281_a1b2c3_OUT\n"
            "COMMIT\n");
}

TEST(Rules, ProbeSourcesReturnInBothChainsBeforeAnyPort) {
  EXPECT_EQ(installRules(kChains, {"10.0.0.7/32", "192.168.0.0/16"}),
            "*nat\n"
            ":SIPHON_f0000281_a1b2c3_PRE - [0:0]\n"
            ":SIPHON_f0000281_a1b2c3_OUT - [0:0]\n"
            "-A SIPHON_f0000281_a1b2c3_PRE -m conntrack --ctstate INVALID -j RETURN\n"
            "-A SIPHON_f0000281_a1b2c3_OUT -m mark --mark 0x53490000/0xffff0000 -j RETURN\n"
            "-A SIPHON_f0000281_a1b2c3_PRE -s 10.0.0.7/32 -j RETURN\n"
            "-A SIPHON_f0000281_a1b2c3_OUT -s 10.0.0.7/32 -j RETURN\n"
            "-A SIPHON_f0000281_a1b2c3_PRE -s 192.168.0.0/16 -j RETURN\n"
            "-A SIPHON_f0000281_a1b2c3_OUT -s 192.168.0.0/16 -j RETURN\n"
            "-A PREROUTING -j SIPHON_f0000281_a1b2c3_PRE\n"
            "-I OUTPUT 1 -j SIPHON_f0000281_a1b2c3_OUT\n"
            "COMMIT\n");
}

TEST(Rules, PortRulesOnlyForLocalDestinationsInBothChains) {
  EXPECT_EQ(addPortRules(kChains, 80, 40001),
            "*nat\n"
            "-A SIPHON_f0000281_a1b2c3_PRE -p tcp -m addrtype --dst-type LOCAL -m tcp --dport 80 "
            "-j REDIRECT --to-ports 40001\n"
            "-A SIPHON_f0000281_a1b2c3_OUT -p tcp -m addrtype --dst-type LOCAL -m tcp --dport 80 "
            "-j REDIRECT --to-ports 40001\n"
            "COMMIT\n");
  std::string removal = removePortRules(kChains, 80, 40001);
  EXPECT_THAT(removal,
              HasSubstr("-D SIPHON_f0000281_a1b2c3_PRE -p tcp -m addrtype --dst-type LOCAL "
                        "-m tcp --dport 80 -j REDIRECT --to-ports 40001\n"));
  EXPECT_THAT(removal, HasSubstr("-D SIPHON_f0000281_a1b2c3_OUT "));
  EXPECT_EQ(removal.find("-A "), std::string::npos);
  // No chain declaration: in --noflush mode it would flush the chain and
  // drop the other ports.
  EXPECT_EQ(addPortRules(kChains, 80, 1).find(":SIPHON"), std::string::npos);
}

// A port is given back by a RETURN ahead of its REDIRECT, in both chains,
// and steered again by deleting that RETURN only.
TEST(Rules, ReleaseAddsAReturnFirstAndReclaimDeletesIt) {
  EXPECT_EQ(releasePortRules(kChains, 80),
            "*nat\n"
            "-I SIPHON_f0000281_a1b2c3_PRE 1 -p tcp -m tcp --dport 80 -j RETURN\n"
            "-I SIPHON_f0000281_a1b2c3_OUT 1 -p tcp -m tcp --dport 80 -j RETURN\n"
            "COMMIT\n");
  EXPECT_EQ(reclaimPortRules(kChains, 80),
            "*nat\n"
            "-D SIPHON_f0000281_a1b2c3_PRE -p tcp -m tcp --dport 80 -j RETURN\n"
            "-D SIPHON_f0000281_a1b2c3_OUT -p tcp -m tcp --dport 80 -j RETURN\n"
            "COMMIT\n");
}

// What iptables-nft-save prints with our chains, a stale copy of another
// target's, and a mesh's rules around them.
constexpr char kSave[] =
    "# Generated by iptables-nft-save v1.8.9 (nf_tables) on Mon Nov 30 02:20:54 2026\n"
    "*filter\n"
    ":INPUT ACCEPT [0:0]\n"
    "-A INPUT -j SIPHON_f0000281_a1b2c3_PRE\n"  // not nat: not ours to touch
    "COMMIT\n"
    "*nat\n"
    ":PREROUTING ACCEPT [0:0]\n"
    ":INPUT ACCEPT [0:0]\n"
    ":OUTPUT ACCEPT [0:0]\n"
    ":POSTROUTING ACCEPT [0:0]\n"
    ":ISTIO_REDIRECT - [0:0]\n"
    ":SIPHON_f0000281_a1b2c3_OUT - [0:0]\n"
    ":SIPHON_f0000281_a1b2c3_PRE - [0:0]\n"
    ":SIPHON_deadbeef_PRE - [0:0]\n"
    "-A PREROUTING -j SIPHON_f0000281_a1b2c3_PRE\n"
    "-A PREROUTING -j SIPHON_deadbeef_PRE\n"
    "-A PREROUTING -p tcp -j ISTIO_REDIRECT\n"
    "-A OUTPUT -j SIPHON_f0000281_a1b2c3_OUT\n"
    "-A OUTPUT -p tcp -m comment --comment \"to SIPHON_f0000281_a1b2c3_OUT\" -j ISTIO_REDIRECT\n"
    "-A SIPHON_f0000281_a1b2c3_OUT -m mark --mark 0x53490000/0xffff0000 -j RETURN\n"
    "-A SIPHON_f0000281_a1b2c3_PRE -p tcp -m addrtype --dst-type LOCAL -m tcp --dport 80 -j "
    "REDIRECT "
    "--to-ports 40001\n"
    "-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 15001\n"
    "COMMIT\n"
    "# Completed on Mon Nov 30 02:20:54 2026\n";

TEST(Save, FindsOurChainsAndTheJumpsToThemInNatOnly) {
  NatState state = parseNatSave(kSave, kChains);
  EXPECT_TRUE(state.has_pre);
  EXPECT_TRUE(state.has_out);
  EXPECT_THAT(state.jumps, ElementsAre("PREROUTING -j SIPHON_f0000281_a1b2c3_PRE",
                                       "OUTPUT -j SIPHON_f0000281_a1b2c3_OUT"));
  EXPECT_FALSE(state.empty());
}

TEST(Save, RemovalDeletesJumpsBeforeChains) {
  std::string text = removeAllRules(parseNatSave(kSave, kChains), kChains);
  EXPECT_EQ(text,
            "*nat\n"
            "-D PREROUTING -j SIPHON_f0000281_a1b2c3_PRE\n"
            "-D OUTPUT -j SIPHON_f0000281_a1b2c3_OUT\n"
            "-F SIPHON_f0000281_a1b2c3_PRE\n"
            "-F SIPHON_f0000281_a1b2c3_OUT\n"
            "-X SIPHON_f0000281_a1b2c3_PRE\n"
            "-X SIPHON_f0000281_a1b2c3_OUT\n"
            "COMMIT\n");
  // The other target's chain stays.
  EXPECT_EQ(text.find("deadbeef"), std::string::npos);
}

TEST(Save, OnlyWhatExistsIsRemoved) {
  // A half-removed state (only the PRE chain, jump gone).
  NatState state = parseNatSave(
      "*nat\n:PREROUTING ACCEPT [0:0]\n:SIPHON_f0000281_a1b2c3_PRE - [0:0]\nCOMMIT\n", kChains);
  EXPECT_EQ(removeAllRules(state, kChains),
            "*nat\n-F SIPHON_f0000281_a1b2c3_PRE\n-X SIPHON_f0000281_a1b2c3_PRE\nCOMMIT\n");
}

TEST(Save, NothingOfOursMeansNoRestoreInput) {
  EXPECT_TRUE(parseNatSave("", kChains).empty());
  EXPECT_TRUE(parseNatSave("*nat\n:PREROUTING ACCEPT [0:0]\nCOMMIT\n", kChains).empty());
  // Another target's chains are not ours.
  EXPECT_TRUE(parseNatSave(kSave, chainNamesFor(0x12345678, "a1b2c3")).empty());
  EXPECT_EQ(removeAllRules(NatState{}, kChains), "");
}

TEST(Save, CountsRulesOfEveryTable) {
  EXPECT_EQ(countRules(kSave), 9u);
  EXPECT_EQ(countRules("*nat\n:PREROUTING ACCEPT [0:0]\nCOMMIT\n"), 0u);
  EXPECT_EQ(countRules(""), 0u);
}

TEST(Flavor, AutoPrefersTheFlavourWithRulesElseNft) {
  FlavorProbe nft{true, 0}, legacy{true, 0};
  EXPECT_EQ(*chooseFlavor("auto", nft, legacy), IptablesFlavor::kNft);
  legacy.rules = 3;
  EXPECT_EQ(*chooseFlavor("auto", nft, legacy), IptablesFlavor::kLegacy);
  nft.rules = 5;
  EXPECT_EQ(*chooseFlavor("auto", nft, legacy), IptablesFlavor::kNft);
  // Only one installed: that one, whatever the counts.
  EXPECT_EQ(*chooseFlavor("auto", FlavorProbe{false, 0}, FlavorProbe{true, 0}),
            IptablesFlavor::kLegacy);
  EXPECT_EQ(*chooseFlavor("auto", FlavorProbe{true, 0}, FlavorProbe{false, 9}),
            IptablesFlavor::kNft);
}

TEST(Flavor, ExplicitChoiceNeedsItsTools) {
  FlavorProbe yes{true, 0}, no{false, 0};
  EXPECT_EQ(*chooseFlavor("legacy", no, yes), IptablesFlavor::kLegacy);
  EXPECT_EQ(*chooseFlavor("nft", yes, FlavorProbe{true, 100}), IptablesFlavor::kNft);
  auto missing = chooseFlavor("nft", no, yes);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("iptables-nft"));
  EXPECT_EQ(chooseFlavor("auto", no, no).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(chooseFlavor("both", yes, yes).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace siphon::agent::steal
