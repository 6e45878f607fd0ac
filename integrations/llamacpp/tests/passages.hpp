#pragma once
// The passages both llama.cpp tests build their prompts from.
#include <string>
#include <vector>

namespace kvfuse_llamacpp_test {

inline const std::vector<std::string> kPassages = {
    "The opera Rusalka was composed by Antonin Dvorak, who was born in Nelahozeves, in what is now the Czech "
    "Republic. He spent most of his life in Prague and a few years in New York.",
    "Prague is the capital and largest city of the Czech Republic. The Vltava river flows through the city, "
    "crossed by the Charles Bridge and many others.",
    "Bohemia is a historical region in the west of the Czech Republic. Its rivers drain into the Elbe, which "
    "flows north into Germany and reaches the North Sea at Hamburg.",
    "Vienna lies on the Danube. The river flows east from the Black Forest through Austria, Slovakia and Hungary "
    "to the Black Sea."};

}  // namespace kvfuse_llamacpp_test
