package openai
