package grammar

// JSONGrammarForTest exposes the test JSON grammar to package grammar_test.
const JSONGrammarForTest = jsonGrammar
